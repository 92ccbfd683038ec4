// The per-element maths of the model operations (sapipe/nn.h) that the CUDA kernels in
// nn_ops.cu apply, compiled for the host too (element.cuh) so that native/tests/cuda_math_check.cpp
// checks it against the CPU table on every machine. The same cases, in the same order, as
// native/cpu/nn_ops.cpp.
#pragma once

#include <stddef.h>

#include "element.cuh"
#include "sapipe/nn.h"

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

// GELU, tanh form: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x s with
// s = sigmoid(2 u) = 0.5 (1 + tanh(u)): the same function without tanh's cancellation in
// 1 + tanh(u) for negative x, so the result keeps its relative precision there. s and 1 - s come
// from exp(-2|u|) <= 1, which cannot overflow.
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

SAPIPE_ELEMENT float gelu_u(float x) { return kGeluC * (x + kGeluA * x * x * x); }

// sigmoid(2u) and 1 - sigmoid(2u).
SAPIPE_ELEMENT void gelu_sigmoid(float u, float* s, float* one_minus_s) {
  const float t = expf(-2.0f * fabsf(u));
  const float r = 1.0f / (1.0f + t);
  *s = u >= 0.0f ? r : t * r;
  *one_minus_s = u >= 0.0f ? t * r : r;
}

SAPIPE_ELEMENT float gelu_element(float x) {
  float s, oms;
  gelu_sigmoid(gelu_u(x), &s, &oms);
  return x * s;
}

// d gelu / dx times dy, from the forward input x: s + 2 x s (1 - s) du/dx (= 0.5 (1 + tanh u) +
// 0.5 x (1 - tanh^2 u) du/dx).
SAPIPE_ELEMENT float gelu_backward_element(float x, float dy) {
  float s, oms;
  gelu_sigmoid(gelu_u(x), &s, &oms);
  const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return dy * (s + 2.0f * x * s * oms * du);
}

// One output of the layer norm from its row's mean and rstd.
SAPIPE_ELEMENT float layer_norm_element(float x, float mean, float rstd, float gamma, float beta) {
  return (x - mean) * rstd * gamma + beta;
}

// One dx of the layer norm's backward: rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma.
SAPIPE_ELEMENT float layer_norm_dx_element(float dy, float gamma, float xhat, float rstd, float mean_g, float mean_gx) {
  return rstd * (dy * gamma - mean_g - xhat * mean_gx);
}

// A token number held as a float: an integer in [0, vocab).
SAPIPE_ELEMENT bool token_is_valid(float token, size_t vocab) {
  return token >= 0.0f && token < static_cast<float>(vocab) && token == floorf(token);
}

// Inverted dropout of one element (the mask from sapipe_dropout_uniform, sapipe/nn.h).
SAPIPE_ELEMENT float dropout_element(float x, float p, float scale, uint64_t seed, uint64_t index) {
  return sapipe_dropout_uniform(seed, index) >= p ? x * scale : 0.0f;
}

// One key of an online softmax (attention): with the row's running max m and sum l so far and
// the new score s, the factor c the partial output is rescaled by and the weight p of the new
// value (acc = acc c + p v); the first key (m = -inf) gives c = 0, p = 1.
SAPIPE_ELEMENT void online_softmax_step(float s, float* m, float* l, float* c, float* p) {
  if (s > *m) {
    *c = expf(*m - s);
    *p = 1.0f;
    *l = *l * *c + 1.0f;
    *m = s;
  } else {
    *c = 1.0f;
    *p = expf(s - *m);
    *l += *p;
  }
}

// The score gradient of attention: ds = p (dout_i . v_j - dout_i . o_i).
SAPIPE_ELEMENT float attention_ds_element(float p, float dp, float d_row) { return p * (dp - d_row); }

// ---- 2-D pooling: a window, and the windows over one input value ---------------------------------

// The average of a window with top-left (y0, x0): the values inside summed row by row, divided by
// the whole window's area (the padding counts as zeros).
SAPIPE_ELEMENT float avg_pool_element(const float* plane, size_t h, size_t w, ptrdiff_t y0, ptrdiff_t x0, size_t kh, size_t kw) {
  float sum = 0.0f;
  for (size_t r = 0; r < kh; ++r)
    for (size_t c = 0; c < kw; ++c) {
      const ptrdiff_t y = y0 + static_cast<ptrdiff_t>(r), x = x0 + static_cast<ptrdiff_t>(c);
      if (y >= 0 && y < static_cast<ptrdiff_t>(h) && x >= 0 && x < static_cast<ptrdiff_t>(w)) sum += plane[static_cast<size_t>(y) * w + static_cast<size_t>(x)];
    }
  return sum / static_cast<float>(kh * kw);
}

// The outputs along one axis whose window covers input position i: [*first, *last).
SAPIPE_ELEMENT void pool_windows_over(size_t i, size_t kernel, size_t stride, size_t pad, size_t out, size_t* first, size_t* last) {
  const ptrdiff_t hi = static_cast<ptrdiff_t>(i + pad);  // o stride <= i + pad
  const ptrdiff_t lo = hi - static_cast<ptrdiff_t>(kernel) + 1;  // o stride >= i + pad - kernel + 1
  const size_t f = lo <= 0 ? 0 : (static_cast<size_t>(lo) + stride - 1) / stride;
  const size_t l = static_cast<size_t>(hi) / stride + 1;
  *first = f;
  *last = l < out ? l : out;
}

// One input value's gradient of the pooling: the outputs whose windows cover it, in output order
// (the CPU's scatter order), max adding those whose window's first largest value it is.
SAPIPE_ELEMENT float pool_grad_element(const float* plane, const float* dplane_out, size_t h, size_t w, size_t iy, size_t ix, size_t kh,
                                       size_t kw, size_t sh, size_t sw, size_t ph, size_t pw, size_t oh, size_t ow, bool max) {
  size_t y_first, y_last, x_first, x_last;
  pool_windows_over(iy, kh, sh, ph, oh, &y_first, &y_last);
  pool_windows_over(ix, kw, sw, pw, ow, &x_first, &x_last);
  const size_t self = iy * w + ix;
  const float area = static_cast<float>(kh * kw);
  float sum = 0.0f;
  for (size_t oy = y_first; oy < y_last; ++oy)
    for (size_t ox = x_first; ox < x_last; ++ox) {
      const float g = dplane_out[oy * ow + ox];
      if (!max) {
        sum += g / area;
        continue;
      }
      const ptrdiff_t y0 = static_cast<ptrdiff_t>(oy * sh) - static_cast<ptrdiff_t>(ph);
      const ptrdiff_t x0 = static_cast<ptrdiff_t>(ox * sw) - static_cast<ptrdiff_t>(pw);
      if (sapipe_nn_max_pool_at(plane, h, w, y0, x0, kh, kw) == self) sum += g;
    }
  return sum;
}

}  // namespace sapipe::cuda
