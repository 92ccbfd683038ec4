// The per-element maths of the model operations (sapipe/nn.h) that the CUDA kernels in
// nn_ops.cu apply, compiled for the host too (element.cuh) so that native/tests/cuda_math_check.cpp
// checks it against the CPU table on every machine. The same cases, in the same order, as
// native/cpu/nn_ops.cpp.
#pragma once

#include <stddef.h>

#include "element.cuh"

namespace sapipe::cuda {

SAPIPE_ELEMENT float relu_element(float x) { return x > 0.0f ? x : 0.0f; }

SAPIPE_ELEMENT float relu_backward_element(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// A label is a class number held as a float; anything else gives a NaN loss and a zero gradient.
SAPIPE_ELEMENT bool label_is_class(float label, size_t classes) {
  return label >= 0.0f && label < static_cast<float>(classes) && label == floorf(label);
}

// One logit's gradient of the softmax cross-entropy: (softmax - onehot) * scale, from the row's
// max and its sum of exp(z - max).
SAPIPE_ELEMENT float xent_grad_element(float z, float max, float sum, bool is_label, float scale) {
  const float p = expf(z - max) / sum;
  return (p - (is_label ? 1.0f : 0.0f)) * scale;
}

// The row's loss: log(sum) + max - z[label].
SAPIPE_ELEMENT float xent_loss_element(float z_label, float max, float sum) { return logf(sum) + max - z_label; }

}  // namespace sapipe::cuda
